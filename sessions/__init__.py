"""Sessions and jobs: state machines, prompt memory, media streams with PTS, events, store."""
