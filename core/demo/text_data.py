"""The demo task: pull a person's details out of a sentence and answer with one exact line of JSON.

SmolLM2-135M-Instruct understands the request but does not answer in the exact format (it adds prose, other
keys or quotes the age), so held-out exact match starts near zero; a few minutes of LoRA teach it the format.
The shipped files under resources/datasets/json_extract/ are `write_demo_dataset()`'s output; a test checks
that they still match, so the dataset stays reproducible.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SYSTEM = "You extract facts and reply with JSON only."
INSTRUCTION = "Extract the person's name, age, city and job from the text. Reply with one line of JSON."

FIRST = [
    "Maria",
    "James",
    "Aiko",
    "Omar",
    "Lena",
    "Carlos",
    "Priya",
    "Tom",
    "Fatima",
    "Ivan",
    "Chloe",
    "Kwame",
    "Sofia",
    "Liam",
    "Mei",
    "Noah",
    "Elena",
    "Yusuf",
    "Hannah",
    "Diego",
    "Ingrid",
    "Ravi",
    "Zoe",
    "Mateo",
    "Amara",
    "Felix",
    "Nadia",
    "Hugo",
    "Leila",
    "Oscar",
    "Grace",
    "Kenji",
    "Clara",
    "Tariq",
    "Julia",
    "Arjun",
]
LAST = [
    "Lopez",
    "Smith",
    "Tanaka",
    "Haddad",
    "Weber",
    "Silva",
    "Sharma",
    "Brown",
    "Khan",
    "Petrov",
    "Martin",
    "Mensah",
    "Rossi",
    "Murphy",
    "Chen",
    "Cohen",
    "Novak",
    "Demir",
    "Schmidt",
    "Garcia",
    "Berg",
    "Patel",
    "Dubois",
    "Fernandez",
    "Okafor",
    "Wagner",
    "Ali",
    "Moreau",
    "Nasser",
    "Larsen",
    "Kim",
    "Sato",
    "Costa",
]
CITIES = [
    "Lisbon",
    "Boston",
    "Osaka",
    "Cairo",
    "Berlin",
    "Lima",
    "Mumbai",
    "Dublin",
    "Lahore",
    "Kazan",
    "Lyon",
    "Accra",
    "Turin",
    "Cork",
    "Chengdu",
    "Haifa",
    "Prague",
    "Izmir",
    "Munich",
    "Seville",
    "Bergen",
    "Pune",
    "Nantes",
    "Quito",
    "Lagos",
    "Vienna",
    "Dubai",
    "Nice",
    "Amman",
    "Oslo",
    "Busan",
    "Kyoto",
    "Porto",
]
JOBS = [
    "nurse",
    "teacher",
    "pilot",
    "chef",
    "architect",
    "baker",
    "dentist",
    "lawyer",
    "plumber",
    "engineer",
    "florist",
    "librarian",
    "farmer",
    "painter",
    "pharmacist",
    "journalist",
    "carpenter",
    "designer",
    "electrician",
    "photographer",
    "accountant",
    "mechanic",
    "surgeon",
    "translator",
    "musician",
    "tailor",
]
TEMPLATES = [
    "{name} is {age} years old and works as a {job} in {city}.",
    "Meet {name}, a {age}-year-old {job} from {city}.",
    "{name}, {age}, lives in {city} and is a {job}.",
    "In {city}, {name} ({age}) works as a {job}.",
    "Name: {name}. Based in {city}. Occupation: {job}. Age: {age}.",
    "At {age}, {name} is a well-known {job} in {city}.",
    "The {job} {name} is {age} and calls {city} home.",
    "{name} moved to {city} to work as a {job}. {name} is {age}.",
    "Our newest {job} is {name}, aged {age}, who joins us from {city}.",
    "A {age} year old {job} named {name} opened a studio in {city}.",
]


def make_row(rng: random.Random) -> tuple[dict, dict]:
    """One conversation row and the facts it encodes."""
    facts = {
        "name": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
        "age": rng.randint(19, 87),
        "city": rng.choice(CITIES),
        "job": rng.choice(JOBS),
    }
    text = rng.choice(TEMPLATES).format(**facts)
    row = {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{INSTRUCTION}\n\nText: {text}"},
            {"role": "assistant", "content": json.dumps(facts)},
        ]
    }
    return row, facts


def make_dataset(n_train: int = 360, n_eval: int = 40, seed: int = 7) -> tuple[list[dict], list[dict]]:
    """Train and held-out rows; no held-out person (name) appears in training."""
    rng = random.Random(seed)
    train, eval_rows, seen = [], [], set()
    while len(train) < n_train:
        row, facts = make_row(rng)
        seen.add(facts["name"])
        train.append(row)
    while len(eval_rows) < n_eval:
        row, facts = make_row(rng)
        if facts["name"] not in seen:
            seen.add(facts["name"])
            eval_rows.append(row)
    return train, eval_rows


def write_demo_dataset(folder: Path) -> None:
    train, eval_rows = make_dataset()
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("eval.jsonl", eval_rows)):
        with open(folder / name, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
