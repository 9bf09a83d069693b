"""The engine as a LiveKit room participant: the room port, inputs, video sink, avatar speech and
join tokens."""
