"""Evaluation runs behind `mmaccel eval`: FID of image sets, sample sets of image methods, WER of
speech methods — resumable, and data-parallel under torchrun / accelerate with results identical
to one process.

    distributed.py   process group from the launcher's environment, round-robin sharding, gathering
    rundir.py        the output directory: config.json, fixed global batches, atomic per-batch records
    image_files.py   image folders and .npz files as validated image sets
    fid.py           `eval fid`: sharded features, reference statistics, FID with a bootstrap std
    image.py         `eval image`: generate, save, score an image method
    wer.py           `eval wer`: transcribe, save, score a speech method
    cli.py           `add_eval_parser` (the argparse definitions live in `mmaccel/cli/eval.py`)
"""
