"""``dreamrt serve``'s settings as one frozen ``ServerConfig``: the fields, their groups, the limits
and the sources they are read from."""
