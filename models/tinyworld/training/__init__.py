"""tiny-world's recipe: the training clips and pairs, the teacher-forced forward, the action probe
and the trainer.
"""
