"""Budgets: what a tenant, or one of its projects, means to spend in a month, weighed against billing's own
projection of the month's cost (`billing.spend`).

- `standing.py`: each budget as the month stands (projected, spent to date), and what a request would add;
  the check billing registers in `pools.budgets`, which holds a request that passes a hard budget.
- `services.py`: set and remove a budget (a tenant's admins, audited).
- `warnings.py`: the e-mails to a tenant's admins at 80 % and 100 % of a budget, once each a month.
- `views.py`, `api.py`: the budgets page, the sections of the tenant, project and approval pages, the API.
"""
