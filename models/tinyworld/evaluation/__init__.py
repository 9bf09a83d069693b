"""`dreamrt eval tiny-world`: a synchronous stream through the real loop, the pixel-statistics
classifiers and the scored evaluation.
"""
