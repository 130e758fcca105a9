"""The controller's process (PID 1 of a sandbox, asyncio); see sandboxd.agent."""
