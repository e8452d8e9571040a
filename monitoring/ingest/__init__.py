"""Readings in: the node agent that pushes them (`agent`), the endpoint it posts to (`api`, `serializers`,
`authentication`, its `tokens`), the portal's own collection of clusters (`collection`), and the one path
every reading takes into storage (`readings.ingest`)."""
