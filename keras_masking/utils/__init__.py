"""Small helpers at the backend edge."""
