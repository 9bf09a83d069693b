"""Operations of a running server: metrics, memory and event-loop watchdogs, heap trimming, graceful
shutdown, the warm-up and the compile cache."""
