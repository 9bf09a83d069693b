"""What every HTTP edge shares below its routes: bearer-token auth, ``ApiError`` and its JSON body,
the request guard, the REST bodies and SSE framing."""
