"""Alerts: what each kind of rule watches (`rules`), firing, resolving and acknowledging them
(`services`), and the operators' alert pages (`views`, `urls`). Telling people is
`monitoring.notifications`'s."""
