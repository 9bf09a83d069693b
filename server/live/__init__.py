"""What every live transport (WebRTC, WHEP, LiveKit) shares with its session: the control channel's
messages, the inbox that applies them and the frame pacer."""
