"""The SEP-2663 tasks surface: tools/call creating tasks, tasks/get|update|cancel, subscriptions/listen."""
