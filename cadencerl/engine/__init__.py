"""Real-engine layer: a tiny local model, an asyncio vLLM client and a local server pool."""
