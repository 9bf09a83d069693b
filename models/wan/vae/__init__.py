"""The Wan2.1 video VAE: its config and checkpoint key map, the causal encoder and decoder, their
blocks and feature caches, and the decode's spatial split over an ``sp`` group.
"""
