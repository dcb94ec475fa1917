"""The one check of staged text sources (CSV files, a text folder's files): their bytes are UTF-8 text, else a
ConfigError naming the file, the first bad byte and the fix, where Python would fail with a decoding traceback or the
csv module on a NUL byte."""

from common.errors import ConfigError


def decode(data: bytes, *, named: str, not_utf8_fix: str, binary_fix: str) -> str:
    """`data` as text (a UTF-8 byte-order mark, as Excel's "CSV UTF-8" writes, dropped). `named` names the file in
    the messages ('--from_csv: PATH'); the fixes end them."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{named} is not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start}): "
                          f"{not_utf8_fix}") from None
    if "\0" in text:
        raise ConfigError(f"{named} holds NUL bytes, so it is not a text {binary_fix}")
    return text
