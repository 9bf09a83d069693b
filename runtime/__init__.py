"""dreamrt runtime: loop contract, driver, scheduler, admission, cost model, pools, engine.

Imports none of models/, sessions/, server/ (docs/architecture.md §1).
"""
