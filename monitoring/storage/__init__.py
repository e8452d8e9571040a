"""GPU samples in storage: day partitions, roll-ups, retention and series read for charts (`samples`)."""
