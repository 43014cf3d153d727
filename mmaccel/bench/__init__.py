"""Benchmarks: `mmaccel bench <suite>` compares every method with the AR baseline in one process."""

from mmaccel.bench.asr_nar_suite import build_asr_nar_suite
from mmaccel.bench.asr_suite import build_asr_suite
from mmaccel.bench.core_suite import build_core_suite
from mmaccel.bench.ctc_suite import build_ctc_suite
from mmaccel.bench.image_continuous import build_image_continuous_suite
from mmaccel.bench.image_scale import build_image_scale_suite
from mmaccel.bench.image_suite import build_image_suite
from mmaccel.bench.video_suite import build_video_suite

SUITES = {"core": build_core_suite, "image": build_image_suite, "image-scale": build_image_scale_suite,
          "image-continuous": build_image_continuous_suite, "asr": build_asr_suite,
          "asr-nar": build_asr_nar_suite, "ctc": build_ctc_suite,
          "video": build_video_suite}
__all__ = ["SUITES"]
