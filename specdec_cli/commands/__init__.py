"""`run` and `chat`: requests, prompts, what is kept between runs, the two adapters."""
