"""REST API of the pools app: clusters and capacity, pool requests, pools; `urls` is what the shell serves."""
