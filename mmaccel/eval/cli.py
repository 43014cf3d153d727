"""The `mmaccel eval` commands live with the rest of the command line, in `mmaccel.cli.eval`."""

from mmaccel.cli.eval import add_eval_parser, cmd_eval_fid, cmd_eval_image, cmd_eval_wer

__all__ = ["add_eval_parser", "cmd_eval_fid", "cmd_eval_image", "cmd_eval_wer"]
