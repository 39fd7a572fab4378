"""Serving: the exported SavedModel (`export`), sampling with a key/value cache (`generate`), and the
SageMaker hosting server (`server`, with its framework-free request handling in `app`)."""
