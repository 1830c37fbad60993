"""Two dataset rows with the answer under another name (`result`, a number), and the rows
`load_rows(path, "question", "result")` reads from them, for the tests of every file kind: the
columns as stored (a CSV file's typed as `datasets` types them), the prompt and the answer
text beside them, and the number as stored beside its text (`answer_raw`)."""

ROWS = [
    {"question": "1+1?", "result": 2, "level": "easy"},
    {"question": "2*3?", "result": 6, "level": "hard"},
]
EXPECTED = [
    {**row, "prompt": row["question"], "answer": str(row["result"]), "answer_raw": row["result"]}
    for row in ROWS
]
