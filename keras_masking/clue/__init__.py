"""CLUE 1.1 and FewCLUE from Keras: data, task models, metrics, runs, submissions.

* `read_split` reads a task's split from a data folder (CLUE or FewCLUE
  layout, detected from the files) into records (`TextExample`,
  `ChoiceExample`, `IdiomPassage`, `SpanExample`, `EntityExample`);
* `encode_examples` turns them into static-shape arrays, `build_task_model`
  puts the task kind's head on any encoder of the package, `task_loss` is
  its loss, `decode_predictions` and `score` give predictions and CLUE's
  metric;
* `finetune` runs all of it, with every method as an argument, resumably,
  and writes the submission file (`write_submission`); `check_submission`
  finds what would make CLUE reject a file and `submit` zips a folder of
  runs. ``keras-masking clue`` is the command line;
* `compare` runs `finetune` per method and seed and says whether each
  method helps; `add_character_noise` makes the noised dev it can score
  too (robustness).
"""

from keras_masking.clue.batches import ArrayBatches
from keras_masking.clue.batches import epoch_order
from keras_masking.clue.batches import predict_in_batches
from keras_masking.clue.compare import CompareResult
from keras_masking.clue.compare import compare
from keras_masking.clue.decoding import decode_predictions
from keras_masking.clue.decoding import joint_assignment
from keras_masking.clue.decoding import score
from keras_masking.clue.encoding import EncodedSplit
from keras_masking.clue.encoding import encode_examples
from keras_masking.clue.examples import ChoiceExample
from keras_masking.clue.examples import EntityExample
from keras_masking.clue.examples import IdiomPassage
from keras_masking.clue.examples import SpanExample
from keras_masking.clue.examples import TextExample
from keras_masking.clue.export_run import export_preset
from keras_masking.clue.export_run import export_run
from keras_masking.clue.heads import build_task_model
from keras_masking.clue.heads import task_loss
from keras_masking.clue.method_plan import MethodPlan
from keras_masking.clue.metrics import accuracy
from keras_masking.clue.metrics import cluener_scores
from keras_masking.clue.metrics import cmrc2018_scores
from keras_masking.clue.metrics import entity_f1
from keras_masking.clue.model_source import ModelSource
from keras_masking.clue.model_source import check_max_length
from keras_masking.clue.noise import add_character_noise
from keras_masking.clue.optimization import WarmupLinearDecay
from keras_masking.clue.optimization import fine_tuning_optimizer
from keras_masking.clue.readers import ClueSplit
from keras_masking.clue.readers import detect_benchmark
from keras_masking.clue.readers import iter_examples
from keras_masking.clue.readers import read_split
from keras_masking.clue.readers import read_task_splits
from keras_masking.clue.run_config import RunConfig
from keras_masking.clue.runner import FinetuneResult
from keras_masking.clue.runner import finetune
from keras_masking.clue.submission import build_submission_zip
from keras_masking.clue.submission import check_submission
from keras_masking.clue.submission import submission_file_name
from keras_masking.clue.submission import write_submission
from keras_masking.clue.submit import submit
from keras_masking.clue.tasks import TASKS
from keras_masking.clue.tasks import ClueTask
from keras_masking.clue.tasks import get_task
from keras_masking.clue.tasks import task_names
from keras_masking.models.transformer_tokenizer import tokenize_with_offsets
