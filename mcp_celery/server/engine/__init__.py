"""The task engine: creating, finding, answering and cancelling tasks, and what runs beside it."""
