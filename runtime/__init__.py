"""dreamrt runtime: loop contract, driver, scheduler, admission, cost model, pools, engine.

Imports none of models/, sessions/, server/ (ARCHITECTURE.md §2).
"""
