"""What several adapters share: the pair lifecycle (lifecycle.py: load, fit, draft, split into
serve's slots, remember what was measured), prompting, tool calls, the drafter a request
asks for, the prompt and cost caches, and --history on disk. run, chat, serve and bench use
them; they know nothing of terminals or HTTP."""
