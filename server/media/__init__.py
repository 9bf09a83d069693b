"""The WebRTC edge: the viewer's peer and paced track, WHEP playback resources, TURN credentials and
a job's preview."""
