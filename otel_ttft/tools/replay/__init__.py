"""Drive a real vLLM OpenAI-compatible server: start/stop it, send requests, run the demo."""
