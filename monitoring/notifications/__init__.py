"""Telling people, the one way for alerts and GPU faults alike: who hears of what, one row per channel and
target (`recording`), and sending each row once, retried until sent or given up (`sending`)."""
