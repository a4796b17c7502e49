"""Running an optimisation: card scheduling, budgets, the asyncio orchestrator, resume and control."""
