"""What if the fleet had been different: a month of the portal's own requests simulated on today's fleet and
on a changed one, asked for by operators and run by workers of their own.

- `report.py`: the one way to run it (`run_whatif`), for `manage.py simulate --history` and the workers; the
  simulation itself is pure (pools/placement/simulation.py, pools/placement/whatif.py).
- `runs.py`: kept runs (pools/models/whatif.py) from asked to done or failed: the service.
- `selectors.py`: reads of kept runs for the pages; `forms.py`, `views.py`, `charts.py`: the operators' pages
  and their SVG charts; `admin.py`: the runs, read only, in Django's admin.
"""
