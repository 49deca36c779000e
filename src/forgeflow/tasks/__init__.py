"""The life of a task: intake, scheduling, preparing, the turn, moves, replies,
publishing, operator controls."""
