"""The checks every class-folder source shares (image folders, text folders: DIR/<split>/<class>/<files>): at least
two classes, and no class folder without examples (its class would be staged with no examples, or, in an
evaluation split, one that is never tested)."""

from common.errors import ConfigError
from common.storage_paths import join


def checked_class_names(listing: dict, root: str, whole: bool, *, flag: str, no_files: str, fix: str) -> list[str]:
    """The sorted class names of `listing` ({split: {class: [files]}}); a ConfigError naming `flag` when there are
    fewer than two, or naming the first class folder without files (`no_files`: 'no .txt files'; `fix`: what to
    do)."""
    class_names = sorted({name for classes in listing.values() for name in classes})
    if len(class_names) < 2:
        raise ConfigError(f"{flag}={root!r} has the classes {class_names}; classification needs at least two class "
                          "sub-folders per split (DIR/train/<class>/).")
    empty = [join(root, "" if whole else split, name) for split, classes in listing.items()
             for name, files in classes.items() if not files]
    if empty:
        raise ConfigError(f"{flag}: the class folder {empty[0]} has {no_files}"
                          f"{f' (nor do {len(empty) - 1} more)' if len(empty) > 1 else ''}. {fix}")
    return class_names
