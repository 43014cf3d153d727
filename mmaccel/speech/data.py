"""Speech evaluation and training data: JSONL manifests, the real clips Debian ships, and a
synthetic corpus spoken by Debian's TTS voices.

A manifest is JSON lines with `audio_filepath`, `text`, `duration` (seconds) and an `id` (the
NeMo / Open ASR Leaderboard convention). Real speech: the 5 LibriVox utterances and 5 "cards" clips
of `pocketsphinx-testdata` (with their transcripts) and the 8 ALSA channel clips of `alsa-utils`
(transcript = file name). Synthetic speech: sentences from the `fortunes` package (real English
quotations, filtered to plain 6–24-word sentences) spoken by flite, festival and espeak-ng voices;
a stable hash of each sentence puts one in ten into the evaluation split, and the evaluation voices
are never used for training.

Out of domain (`build_ood_corpus`): sentences of the software licences every Debian system carries
(`/usr/share/common-licenses`: legal and technical prose, unlike any quotation), spoken by voices no
training set uses (`OOD_VOICES`), half of them under noise (pink or babble at 5-15 dB SNR, seeded):
a set no draft, head or trained model of this library has seen in any way.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.speech.text_sources import is_plain, plain_sentences

SPHINX_DATA = Path("/usr/share/pocketsphinx/test/data")
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")
FORTUNES = Path("/usr/share/games/fortunes")
LICENSES = Path("/usr/share/common-licenses")       # Debian's base-files: the out-of-domain text source
# fortune files with plain prose; the rest hold code, verse layouts, or material unfit for a corpus
FORTUNE_FILES = ("education", "food", "fortunes", "humorists", "kids", "law", "literature", "love", "medicine",
                 "miscellaneous", "people", "pets", "platitudes", "science", "sports", "wisdom", "work")
APT_PACKAGES = "pocketsphinx-testdata alsa-utils fortunes flite festival festvox-kallpc16k festvox-kdlpc16k " \
               "festvox-us-slt-hts espeak-ng"


@dataclass
class Utterance:
    audio_filepath: str
    text: str
    duration: float
    id: str = ""
    voice: str = ""     # "human" for real speech, else the TTS voice


def write_manifest(path: str | os.PathLike, utterances: list[Utterance]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(asdict(u)) + "\n" for u in utterances), encoding="utf-8")
    tmp.replace(path)
    return path


def read_manifest(path: str | os.PathLike) -> list[Utterance]:
    """Utterances of a JSONL manifest; relative audio paths are taken relative to the manifest."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"manifest not found: {path}")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{n}: not valid JSON ({err})") from None
        check(isinstance(row, dict), f"{path}:{n}: expected a JSON object with audio_filepath, text and duration")
        missing = [k for k in ("audio_filepath", "text", "duration") if k not in row]
        check(not missing, f"{path}:{n}: missing field(s) {', '.join(missing)}")
        check(isinstance(row["audio_filepath"], str) and row["audio_filepath"].strip() != "",
              f"{path}:{n}: audio_filepath must be a non-empty path, got {row['audio_filepath']!r}")
        check(isinstance(row["text"], str), f"{path}:{n}: text must be a string, got {row['text']!r}")
        check(isinstance(row["duration"], (int, float)) and not isinstance(row["duration"], bool)
              and row["duration"] >= 0, f"{path}:{n}: duration must be seconds >= 0, got {row['duration']!r}")
        audio = Path(row["audio_filepath"])
        row["audio_filepath"] = str(audio if audio.is_absolute() else path.parent / audio)
        row.setdefault("id", Path(row["audio_filepath"]).stem)
        known = {k: row[k] for k in ("audio_filepath", "text", "duration", "id", "voice") if k in row}
        out.append(Utterance(**known))
    check(len(out) > 0, f"manifest {path} has no utterances")
    return out


def _duration(path: Path) -> float:
    import soundfile as sf

    info = sf.info(str(path))
    return round(info.frames / info.samplerate, 3)


def _sphinx_transcripts(file: Path) -> dict[str, str]:
    """`<s> text </s> (id)` lines -> {id: text}."""
    out = {}
    for line in file.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\s*(?:<s>)?\s*(.*?)\s*(?:</s>)?\s*\(([^)]+)\)\s*$", line)
        if m:
            out[m.group(2)] = m.group(1)
    return out


def real_utterances(sphinx: Path = SPHINX_DATA, alsa: Path = ALSA_SOUNDS) -> list[Utterance]:
    """The 18 real human clips with transcripts (LibriVox read speech, cards, ALSA channel names)."""
    if not (sphinx / "librivox").is_dir():
        raise ModelNotFoundError(f"real speech clips not found in {sphinx}; install them with "
                                 "`apt-get install pocketsphinx-testdata` (or `make`)")
    out = []
    for folder, transcript in (("librivox", "transcription"), ("cards", "cards.transcription")):
        texts = _sphinx_transcripts(sphinx / folder / transcript)
        for wav in sorted((sphinx / folder).glob("*.wav")):
            if wav.stem in texts:
                out.append(Utterance(str(wav), texts[wav.stem], _duration(wav), f"{folder}_{wav.stem}", "human"))
    if alsa.is_dir():
        for wav in sorted(alsa.glob("*_*.wav")):
            out.append(Utterance(str(wav), wav.stem.replace("_", " ").lower(), _duration(wav), f"alsa_{wav.stem}", "human"))
    return out


# ---- sentences ------------------------------------------------------------------------------------

def sentences(split: str = "train", fortunes: Path = FORTUNES) -> list[str]:
    """Plain English sentences from the `fortunes` package, in a stable order.

    `split="eval"` is the tenth of sentences whose SHA-1 ends in a multiple of ten; "train" the rest.
    """
    check(split in ("train", "eval"), f"split must be 'train' or 'eval', got {split!r}")
    if not fortunes.is_dir():
        raise ModelNotFoundError(f"sentence source {fortunes} not found; install it with `apt-get install fortunes`")
    seen, out = set(), []
    for name in FORTUNE_FILES:
        file = fortunes / name
        if not file.is_file():
            continue
        for entry in file.read_text(encoding="utf-8", errors="ignore").split("\n%\n"):
            text = " ".join(entry.split())
            text = re.sub(r"\s+--\s.*$", "", text).strip('"')            # drop attributions and quotes
            if not is_plain(text) or text in seen:
                continue
            seen.add(text)
            if is_held_out(text) == (split == "eval"):
                out.append(text)
    return out


def is_held_out(sentence: str) -> bool:
    """The evaluation tenth: sentences whose SHA-1 is a multiple of ten."""
    return int(hashlib.sha1(sentence.encode()).hexdigest(), 16) % 10 == 0


# ---- voices -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Voice:
    name: str
    engine: str     # flite | festival | espeak-ng
    id: str         # the engine's own voice name

    def command(self, text_file: Path, wav: Path) -> list[str]:
        if self.engine == "flite":
            return ["flite", "-voice", self.id, "-f", str(text_file), "-o", str(wav)]
        if self.engine == "festival":
            return ["text2wave", "-eval", f"(voice_{self.id})", "-o", str(wav), str(text_file)]
        return ["espeak-ng", "-v", self.id, "-f", str(text_file), "-w", str(wav)]

    @property
    def program(self) -> str:
        return {"flite": "flite", "festival": "text2wave"}.get(self.engine, "espeak-ng")


VOICES = {v.name: v for v in [
    Voice("flite-kal16", "flite", "kal16"), Voice("flite-awb", "flite", "awb"),
    Voice("flite-rms", "flite", "rms"), Voice("flite-slt", "flite", "slt"),
    Voice("festival-kal", "festival", "kal_diphone"), Voice("festival-ked", "festival", "ked_diphone"),
    Voice("festival-slt-hts", "festival", "cmu_us_slt_arctic_hts"),
    Voice("espeak-en-us", "espeak-ng", "en-us"), Voice("espeak-en-us-m3", "espeak-ng", "en-us+m3"),
    Voice("espeak-en-us-f2", "espeak-ng", "en-us+f2"), Voice("espeak-en-gb", "espeak-ng", "en-gb"),
    Voice("espeak-en-gb-m5", "espeak-ng", "en-gb+m5"), Voice("espeak-en-gb-scotland", "espeak-ng", "en-gb-scotland"),
    Voice("espeak-en-029", "espeak-ng", "en-029"), Voice("espeak-en-gb-x-rp-f3", "espeak-ng", "en-gb-x-rp+f3"),
    Voice("espeak-en-gb-x-gbcwmd", "espeak-ng", "en-gb-x-gbcwmd"),
]}
TRAIN_VOICES = ("flite-kal16", "flite-awb", "festival-kal", "espeak-en-us", "espeak-en-us-m3", "espeak-en-us-f2",
                "espeak-en-gb", "espeak-en-gb-m5", "espeak-en-gb-scotland")
EVAL_VOICES = ("flite-rms", "flite-slt", "festival-ked", "festival-slt-hts")
# the out-of-domain split: three accents no other split uses, and one held-out voice of the eval split
OOD_VOICES = ("espeak-en-029", "espeak-en-gb-x-rp-f3", "espeak-en-gb-x-gbcwmd", "flite-slt")


def synthesize(text: str, voice: Voice, wav: Path) -> Path:
    """Speak `text` with `voice` into `wav` (the engine's native rate; loading resamples)."""
    if shutil.which(voice.program) is None:
        raise ModelNotFoundError(f"TTS program {voice.program!r} for voice {voice.name} not found; "
                                 f"install it with `apt-get install {APT_PACKAGES}`")
    wav.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        text_file, out = Path(tmp) / "text.txt", Path(tmp) / "out.wav"
        text_file.write_text(text + "\n", encoding="utf-8")
        run = subprocess.run(voice.command(text_file, out), capture_output=True, text=True, timeout=120)
        if run.returncode != 0 or not out.is_file() or out.stat().st_size <= 44:
            raise InputError(f"{voice.name} failed to speak {text[:40]!r}: {run.stderr.strip()[-300:]}")
        shutil.move(str(out), wav)
    return wav


TEXTS = ("fortunes", "varied")


def varied_sentences(split: str = "train") -> list[str]:
    """Three text sources interleaved one sentence each in turn: a man page, a Python docstring, a
    `fortunes` quotation (`mmaccel.speech.text_sources`); each source's held-out tenth is `split="eval"`."""
    from mmaccel.speech.text_sources import docstring_sentences, man_sentences

    check(split in ("train", "eval"), f"split must be 'train' or 'eval', got {split!r}")
    sources = [[s for s in found if is_held_out(s) == (split == "eval")]
               for found in (man_sentences(), docstring_sentences())] + [sentences(split)]
    out, seen = [], set()
    for i in range(max(map(len, sources))):
        for source in sources:
            if i < len(source) and source[i] not in seen:
                seen.add(source[i])
                out.append(source[i])
    return out


def build_tts_corpus(out_dir: str | os.PathLike, split: str = "train", voices: tuple[str, ...] | None = None,
                     max_sentences: int | None = None, voices_per_sentence: int = 2, text: str = "fortunes",
                     noisy: bool = False, seed: int = 0) -> Path:
    """Speak the `split` sentences into `<out_dir>/<name>/` and write `<out_dir>/<name>.jsonl`, where
    `name` is the split for `text="fortunes"` (`sentences`) and `varied_<split>` for `text="varied"`
    (`varied_sentences`). Returns the manifest's path.

    Sentence i is spoken by `voices_per_sentence` voices in rotation over `voices` (default: the
    split's voice set). `noisy`: every other utterance is replaced by a seeded augmented copy (speed,
    reverberation, white / pink / babble noise: `mmaccel.speech.ctc.augment`). Existing wav files are
    kept, so an interrupted build resumes.
    """
    check(text in TEXTS, f"text must be one of {', '.join(TEXTS)}, got {text!r}")
    voices = voices or (TRAIN_VOICES if split == "train" else EVAL_VOICES)
    unknown = [v for v in voices if v not in VOICES]
    check(not unknown, f"unknown voice(s) {', '.join(unknown)}; choose from {', '.join(VOICES)}")
    check(1 <= voices_per_sentence <= len(voices), f"voices_per_sentence must be in [1, {len(voices)}]")
    texts = sentences(split) if text == "fortunes" else varied_sentences(split)
    if max_sentences is not None:
        check(max_sentences >= 1, f"max_sentences must be >= 1, got {max_sentences}")
        texts = texts[:max_sentences]
    root = Path(out_dir)
    name = split if text == "fortunes" else f"varied_{split}"
    utterances = []
    for i, sentence in enumerate(texts):
        for j in range(voices_per_sentence):
            voice = VOICES[voices[(i * voices_per_sentence + j) % len(voices)]]
            uid = f"{name}_{i:05d}_{voice.name}"
            wav = root / name / f"{uid}.wav"
            if not wav.is_file():
                synthesize(sentence, voice, wav)
            utterances.append(Utterance(str(wav.relative_to(root)), sentence, _duration(wav), uid, voice.name))
    if noisy:
        utterances = _augment_every_other(root, utterances, seed)
    return write_manifest(root / f"{name}.jsonl", utterances)


def _augment_every_other(root: Path, utterances: list[Utterance], seed: int) -> list[Utterance]:
    """Utterance i (odd) replaced by an augmented copy `<stem>_aug.wav`, seeded by (seed, i); babble
    comes from the three clean utterances before it."""
    import numpy as np
    import soundfile as sf

    from mmaccel.speech.audio import SAMPLE_RATE, load_audio
    from mmaccel.speech.ctc.augment import augment

    out = list(utterances)
    for i in range(1, len(out), 2):
        u = out[i]
        clean = root / u.audio_filepath
        noisy = clean.with_name(clean.stem + "_aug.wav")
        if not noisy.is_file():
            others = [load_audio(root / out[j].audio_filepath).samples for j in range(max(0, i - 5), i, 2)]
            samples = augment(load_audio(clean).samples, np.random.default_rng([seed, i]), others)
            sf.write(str(noisy), samples, SAMPLE_RATE)
        out[i] = Utterance(str(noisy.relative_to(root)), u.text, _duration(noisy), u.id + "_aug", u.voice)
    return out


# ---- the out-of-domain split --------------------------------------------------------------------


def license_sentences(licenses: Path = LICENSES) -> list[str]:
    """Plain 6-24-word sentences of the licence texts (files in name order, duplicates dropped)."""
    if not licenses.is_dir():
        raise ModelNotFoundError(f"sentence source {licenses} not found (Debian's base-files package holds it)")
    seen, out = set(), []
    for file in sorted(licenses.iterdir()):
        if file.is_symlink() or not file.is_file():
            continue
        text = " ".join(file.read_text(encoding="utf-8", errors="ignore").split())
        for sentence in plain_sentences(text):
            if sentence not in seen:
                seen.add(sentence)
                out.append(sentence)
    return out


def build_ood_corpus(out_dir: str | os.PathLike, count: int = 48, seed: int = 0) -> Path:
    """Speak `count` licence sentences (evenly spread over them) with `OOD_VOICES` in rotation into
    `<out_dir>/ood/`; every other utterance gets pink or babble noise (the other clean utterances
    talking) at 5-15 dB SNR. Writes `<out_dir>/ood.jsonl`; existing wavs are kept."""
    import numpy as np
    import soundfile as sf

    from mmaccel.speech.audio import SAMPLE_RATE, load_audio
    from mmaccel.speech.ctc.augment import add_noise, babble_noise, pink_noise

    texts = license_sentences()
    check(1 <= count <= len(texts), f"count must be in [1, {len(texts)}], got {count}")
    picked = [texts[i * len(texts) // count] for i in range(count)]
    root = Path(out_dir)
    clean = []
    for i, text in enumerate(picked):
        voice = VOICES[OOD_VOICES[i % len(OOD_VOICES)]]
        wav = root / "ood" / f"ood_{i:03d}_{voice.name}.wav"
        if not wav.is_file():
            synthesize(text, voice, wav)
        clean.append(wav)
    utterances = []
    for i, (text, wav) in enumerate(zip(picked, clean)):
        voice = OOD_VOICES[i % len(OOD_VOICES)]
        if i % 2:
            noisy = wav.with_name(wav.stem + "_noisy.wav")
            if not noisy.is_file():
                rng = np.random.default_rng([seed, i])
                samples = load_audio(wav).samples
                others = [load_audio(clean[j]).samples for j in range(0, len(clean), 2)]
                noise = pink_noise(len(samples), rng) if i % 4 == 1 else babble_noise(len(samples), others, rng)
                sf.write(str(noisy), add_noise(samples, noise, float(rng.uniform(5, 15))).astype(np.float32), SAMPLE_RATE)
            wav = noisy
        utterances.append(Utterance(str(wav.relative_to(root)), text, _duration(wav), wav.stem, voice))
    return write_manifest(root / "ood.jsonl", utterances)
