"""The processes the controller starts (the zygote, workers, resident servers, the scorer); no asyncio here."""
