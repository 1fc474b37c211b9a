"""The node agent: a warm asyncio daemon that the thin hooks hand work to."""
