"""The churn example's stage code (examples/prep_train_eval.pipe): small, real, stdlib only.

Run from the directory that holds this package (``durapipe run`` starts stages in the pipeline
file's directory, examples/; an image copies the package next to its WORKDIR), so that
``python -m churn.prep`` finds it without installing anything.
"""
