"""Print a compact profile of a table file: python profile_table.py <file> [--rows N].

Reads CSV/TSV/TXT, Parquet, Excel and JSON (lines or records) with pandas and prints shape,
dtypes, missing values, duplicates, numeric summary and the top values of text columns.
"""

import argparse
import sys
from pathlib import Path


def load(path: Path, rows: int | None):
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix in (".csv", ".txt"):
        return pd.read_csv(path, nrows=rows, sep=None, engine="python")
    if suffix == ".tsv":
        return pd.read_csv(path, nrows=rows, sep="\t")
    if suffix == ".parquet":
        frame = pd.read_parquet(path)
        return frame.head(rows) if rows else frame
    if suffix in (".xlsx", ".xls"):
        return pd.read_excel(path, nrows=rows)
    if suffix in (".json", ".jsonl"):
        lines = suffix == ".jsonl"
        frame = pd.read_json(path, lines=lines)
        return frame.head(rows) if rows else frame
    sys.exit(f"unsupported file type {suffix!r}; use csv, tsv, parquet, xlsx or json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--rows", type=int, default=None, help="read only the first N rows")
    args = parser.parse_args()
    if not args.file.is_file():
        sys.exit(f"no such file: {args.file}")

    import pandas as pd

    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 50)
    df = load(args.file, args.rows)

    print(f"# {args.file.name}: {df.shape[0]} rows x {df.shape[1]} columns")
    print(f"memory: {df.memory_usage(deep=True).sum() / 1e6:.1f} MB")
    print("\n## dtypes")
    print(df.dtypes.astype(str).to_string())

    missing = df.isna().mean()
    missing = missing[missing > 0].sort_values(ascending=False)
    print("\n## missing (share of rows)")
    print(missing.round(3).head(30).to_string() if len(missing) else "none")
    print(f"\nduplicate rows: {int(df.duplicated().sum())}")

    numeric = df.select_dtypes(include="number")
    if not numeric.empty:
        print("\n## numeric summary")
        print(numeric.describe().T.round(3).head(40).to_string())

    other = df.select_dtypes(exclude="number")
    for column in other.columns[:20]:
        unique = other[column].nunique(dropna=True)
        print(f"\n## {column}: {unique} distinct")
        if unique <= 0.5 * len(df):  # skip ids and free text
            print(other[column].value_counts(dropna=False).head(8).to_string())


if __name__ == "__main__":
    main()
