"""The engine and its drafters: draft, verify, accept; knows nothing of terminals or HTTP."""
