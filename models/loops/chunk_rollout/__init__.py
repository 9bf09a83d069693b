"""``chunk_rollout``, the chunk-causal loop of sessions: the loop, its serializable state, the plans
of each phase, restarts, forks and the behaviour it captures.
"""
