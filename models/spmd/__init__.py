"""How one model instance runs over the ranks of a node: the plan a card runs under on a world, and
its family's decode split over an ``sp`` group."""
