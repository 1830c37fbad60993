"""Two dataset rows with the answer under another name (`result`, a number), and the rows
`load_rows(path, "question", "result")` reads from them, for the tests of every file kind: the
columns as stored, the prompt and the answer text beside them; from a file that keeps types,
the number as stored beside its text (`answer_raw`) too; from a CSV file, whose values are
text, the text alone."""

ROWS = [
    {"question": "1+1?", "result": 2, "level": "easy"},
    {"question": "2*3?", "result": 6, "level": "hard"},
]
EXPECTED = [
    {**row, "prompt": row["question"], "answer": str(row["result"]), "answer_raw": row["result"]}
    for row in ROWS
]
EXPECTED_TEXT = [
    {**{k: v for k, v in row.items() if k != "answer_raw"}, "result": str(row["result"])}
    for row in EXPECTED
]
