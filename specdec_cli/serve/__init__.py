"""`specdec serve`: OpenAI's API over the engine."""
