"""The plain-call fallback for hosts without the tasks extension."""
