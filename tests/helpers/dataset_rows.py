"""Two dataset rows with the answer under another name (`result`, a number), and the rows
`load_rows(path, "question", "result")` reads from them, for the tests of every file kind."""

ROWS = [
    {"question": "1+1?", "result": 2, "level": "easy"},
    {"question": "2*3?", "result": 6, "level": "hard"},
]
EXPECTED = [
    {"level": "easy", "prompt": "1+1?", "answer": "2"},
    {"level": "hard", "prompt": "2*3?", "answer": "6"},
]
