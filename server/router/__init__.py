"""``dreamrt router``: the fleet's front door, its view of the engines, the placement policy and its
command line."""
