"""The LLM proposer: an OpenAI-compatible client, prompts, reply checks and search moves."""
