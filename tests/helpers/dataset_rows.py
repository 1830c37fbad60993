"""Two dataset rows with the answer under another name (`result`, a number), and the rows
`load_rows(path, "question", "result")` reads from them, for the tests of every file kind: from
a file that keeps types, the number as stored beside its text (`answer_raw`); from a CSV file,
whose values are text, the text alone."""

ROWS = [
    {"question": "1+1?", "result": 2, "level": "easy"},
    {"question": "2*3?", "result": 6, "level": "hard"},
]
EXPECTED = [
    {"level": "easy", "prompt": "1+1?", "answer": "2", "answer_raw": 2},
    {"level": "hard", "prompt": "2*3?", "answer": "6", "answer_raw": 6},
]
EXPECTED_TEXT = [{k: v for k, v in row.items() if k != "answer_raw"} for row in EXPECTED]
