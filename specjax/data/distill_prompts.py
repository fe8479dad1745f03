"""Training prompts for self-distillation, built offline: code tasks over the standard library's
functions, summarization, QA, rewriting and translation over passages (both from
`specjax.data.stdlib_text`), math word problems (`specjax.data.word_problems`), general
instructions, and two-turn chats whose first reply is known text (a docstring, a worked
solution, the passage's own opening). Deterministic from a seed.

Rows have the benchmark's shape (`specjax.data.prompts`: id, category, turns, replies,
prompt), so the target sees training prompts rendered (`specjax.data.chat`) exactly as it will
see benchmark ones.
The benchmark sets stay out: nothing here is drawn from HumanEval or the chat set, the
instruction wordings differ from theirs, and the stdlib modules held out of the corpus
(`corpus.HELD_OUT`) are not used.
"""

from __future__ import annotations

import random
import re

from specjax.data.stdlib_text import passage, sentences, stdlib_function
from specjax.data.word_problems import ITEMS, NAMES, word_problem

CATEGORIES = {  # category -> share of the prompts
    "code": 0.24, "instruction": 0.14, "summarization": 0.1, "qa": 0.12, "rewrite": 0.08,
    "translation": 0.08, "math": 0.12, "multi_turn": 0.12,
}


def _code(src: str) -> str:
    return f"```python\n{src}\n```"


# ---- code ------------------------------------------------------------------------------------------

CODE_TASKS = (
    "Explain what this Python function does, step by step.",
    "Write a clear docstring for the following function.",
    "Add type hints to this function and explain your choices.",
    "Write pytest unit tests for this function, covering normal cases and edge cases.",
    "Review this code: point out possible bugs, unclear names and missing error handling.",
    "Refactor this function to make it easier to read, and say what you changed.",
    "What is the time and space complexity of this function? Justify your answer.",
    "Describe a realistic situation in which you would call this function, with an example call.",
    "Rewrite this function in JavaScript.",
    "Rewrite this function in Go.",
    "Rewrite this function in Rust.",
    "Rewrite this function in Java.",
    "Suggest three ways this function could be made faster or simpler.",
    "Explain this code to someone who knows another language but is new to Python.",
)
LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Polish", "Swedish")


def code_prompt(rng):
    kind = rng.random()
    if kind < 0.7:
        module, name, src, _ = stdlib_function(rng)
        task = rng.choice(CODE_TASKS)
        intro = rng.choice(("", f"This is `{name}` from the standard library module `{module}`.\n\n"))
        return [f"{intro}{task}\n\n{_code(src)}" if rng.random() < 0.5 else f"{_code(src)}\n\n{intro}{task}"]
    module, name, src, doc = stdlib_function(rng, with_doc=True)
    header = src.split("\n", 1)[0]
    summary = " ".join(doc.split("\n\n")[0].split())
    if kind < 0.85:
        stub = f'{header}\n    """{summary[:400]}"""'
        return [f"Implement this Python function. Its docstring says what it should do.\n\n{_code(stub)}"]
    return [f"Write a Python function `{name}` for a module like `{module}`. What it must do: "
            f"{summary[:500]}\nInclude a short usage example."]


# ---- passages: summarization, QA, rewriting, translation -----------------------------------------

SUMMARIZE = (
    "Summarize the text below in {n} sentences.", "Give a TL;DR of this documentation excerpt.",
    "Write a one-paragraph summary of the following text for a beginner.",
    "List the key points of the following text as bullet points.",
    "What is the main idea of this text? Answer in {n} sentences.",
    "Condense the following into at most {w} words.",
    "Explain the following excerpt in simple terms, then summarize it in one line.",
)
QUESTIONS = (
    "What does the text say about {term}?", "Why does {term} matter, according to this text?",
    "Give a short code example that illustrates what the text describes.",
    "What would a beginner find confusing here, and how would you explain it?",
    "Which rules or conditions does the text state? List them.",
    "Write three quiz questions about this text, with answers.",
    "Is this statement supported by the text: \"{claim}\"? Explain briefly.",
)
REWRITE = (
    "Rewrite the following text in plain English for someone who does not program.",
    "Make this text shorter without losing any information.",
    "Rewrite this as a numbered list of steps or rules.",
    "Turn this documentation into a friendly introduction for a blog post.",
    "Rewrite the following in a more formal, precise style.",
    "Rewrite this text as a short dialogue between a teacher and a student.",
)



def summarization_prompt(rng):
    task = rng.choice(SUMMARIZE).format(n=rng.choice(("two", "three", "four")), w=rng.choice((40, 60, 80)))
    return [f"{task}\n\n{passage(rng)}"]


def qa_prompt(rng):
    if rng.random() < 0.4:
        return [general_question(rng)]
    text = passage(rng)
    terms = re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\(\)|\b[a-z]+_[a-z_]+\b|\b[A-Z][a-z]+[A-Z]\w*\b", text)
    words = [w for w in re.findall(r"\b[a-z]{7,}\b", text)]
    term = rng.choice(terms or words or ["this feature"])
    claim = rng.choice(sentences(text) or [text[:120]])
    q = rng.choice(QUESTIONS).format(term=f"`{term}`" if terms else term, claim=claim)
    return [rng.choice((f"Read this text and then answer the question.\n\nText:\n{text}\n\nQuestion: {q}",
                        f"{text}\n\nBased on the text above: {q}"))]


def rewrite_prompt(rng):
    return [f"{rng.choice(REWRITE)}\n\n{passage(rng)}"]


def translation_prompt(rng):
    lang = rng.choice(LANGUAGES)
    if rng.random() < 0.5:
        sentence = rng.choice(sentences(passage(rng)) or ["Every object has an identity, a type and a value."])
    else:
        sentence = everyday_sentence(rng)
    return [rng.choice((f"Please translate this sentence into {lang}:\n{sentence}",
                        f"How would you say this in {lang}? \"{sentence}\"",
                        f"{lang} translation, please: {sentence}"))]


# ---- general instructions and questions ---------------------------------------------------------

CONCEPTS = (
    "photosynthesis", "compound interest", "the water cycle", "plate tectonics", "supply and demand",
    "recursion", "public-key cryptography", "the greenhouse effect", "natural selection", "black holes",
    "machine learning", "the immune response", "electric circuits", "the printing press", "democracy",
    "version control", "the blockchain", "jet engines", "tides", "earthquakes", "the internet",
    "hash tables", "the scientific method", "entropy", "GPS navigation", "solar panels",
    "nuclear fission", "the French Revolution", "the Silk Road", "the Roman Empire", "DNA replication",
    "opportunity cost", "garbage collection", "binary numbers", "caching", "the stock market",
    "rainbows", "volcanoes", "antibodies", "probability", "gravity", "magnetism", "sound waves",
)
PAIRS = (
    ("a list", "a tuple in Python"), ("TCP", "UDP"), ("RAM", "a hard drive"), ("a loan", "a lease"),
    ("an alligator", "a crocodile"), ("mitosis", "meiosis"), ("speed", "velocity"),
    ("a compiler", "an interpreter"), ("stocks", "bonds"), ("a comet", "an asteroid"),
    ("SQL", "NoSQL databases"), ("a republic", "a monarchy"), ("baking soda", "baking powder"),
    ("an epidemic", "a pandemic"), ("renting", "buying a home"), ("weight", "mass"),
    ("git merge", "git rebase"), ("a library", "a framework"), ("latitude", "longitude"),
    ("HTTP", "HTTPS"), ("AC", "DC current"), ("a simile", "a metaphor"), ("fission", "fusion"),
)
ACTIVITIES = (
    "learning to play the guitar", "running a first marathon", "studying for exams", "public speaking",
    "starting a vegetable garden", "saving money on groceries", "learning a new language",
    "working from home", "writing a CV", "training a puppy", "sleeping better", "cooking for a large group",
    "preparing for a job interview", "reading more books", "keeping a small team motivated",
    "debugging a program", "taking better photos with a phone", "moving to a new city",
    "hosting a board game night", "reducing screen time", "learning to swim as an adult",
)
THINGS = (
    "the ocean", "autumn leaves", "a lighthouse", "a busy train station", "the first snow",
    "an old library", "a cup of coffee", "the night sky", "a mountain village", "a rainy afternoon",
    "a lost key", "a robot learning to paint", "a street market", "a long-distance friendship",
)
DEVICES = (
    "a microwave oven", "a touchscreen", "a bicycle gear system", "a thermostat", "an electric car",
    "a QR code", "a smoke detector", "Wi-Fi", "a camera lens", "a search engine", "a heat pump",
    "a barcode scanner", "a 3D printer", "an elevator", "a compass", "a credit card chip",
)
CITIES = ("Kyoto", "Edinburgh", "Montreal", "Istanbul", "Buenos Aires", "Cape Town", "Vienna",
          "Seoul", "Marrakesh", "Prague", "Vancouver", "Hanoi", "Copenhagen", "Oaxaca")
INSTRUCTIONS = (
    "Explain {concept} to a ten-year-old.", "Give me five practical tips for {activity}.",
    "What are the main differences between {a} and {b}?", "Write a short poem about {thing}.",
    "Write a story of about 150 words about {thing}.", "List the pros and cons of {activity}.",
    "How does {device} work? Keep it short.", "Write a short email to a colleague about {activity}.",
    "Plan a {days}-day visit to {city} for someone who loves {interest}.",
    "Describe {concept} in three paragraphs: what it is, why it matters, and a common misconception.",
    "Create a one-week plan for {activity}.", "Write a product description for {device}.",
    "Give an analogy that makes {concept} easy to understand.", "Write a haiku about {thing}.",
    "What are common mistakes people make when {activity}, and how can they avoid them?",
)
INTERESTS = ("food", "history", "architecture", "hiking", "museums", "music", "photography", "markets")


def general_question(rng):
    a, b = rng.choice(PAIRS)
    return rng.choice((
        f"What is {rng.choice(CONCEPTS)}, and why is it important?", f"How do {a} and {b} differ?",
        f"How does {rng.choice(DEVICES)} actually work?", f"What is a simple way to understand {rng.choice(CONCEPTS)}?",
        f"Who benefits most from {rng.choice(ACTIVITIES)}, and why?", f"When should I use {a} rather than {b}?",
    ))


def instruction_prompt(rng):
    a, b = rng.choice(PAIRS)
    return [rng.choice(INSTRUCTIONS).format(
        concept=rng.choice(CONCEPTS), activity=rng.choice(ACTIVITIES), a=a, b=b, thing=rng.choice(THINGS),
        device=rng.choice(DEVICES), days=rng.choice((2, 3, 4, 5)), city=rng.choice(CITIES),
        interest=rng.choice(INTERESTS))]


PLACES = ("the library", "the harbour", "the museum", "the stadium", "the market", "the station", "the park")


def everyday_sentence(rng):
    n1, n2 = rng.sample(NAMES, 2)
    return rng.choice((
        f"{n1} will meet {n2} at {rng.choice(PLACES)} after work on {rng.choice(('Monday', 'Friday', 'Sunday'))}.",
        f"The {rng.choice(ITEMS)[0]} I bought yesterday was cheaper than the one {n1} recommended.",
        f"If it rains tomorrow, we will move the picnic to {rng.choice(PLACES)}.",
        f"{n1} has been learning to cook for three months and now makes dinner every evening.",
        f"Could you please send me the address of {rng.choice(PLACES)} before noon?",
        f"My neighbour {n1} repairs old bicycles and gives them to children in the village.",
        f"The meeting about {rng.choice(ACTIVITIES)} was longer than we expected.",
    ))


# ---- math ----------------------------------------------------------------------------------------

MATH_ASKS = ("Work it out step by step.", "Explain each step.", "Show the calculation.", "Reason it through.")


def math_prompt(rng):
    question, _ = word_problem(rng)
    return [f"{question} {rng.choice(MATH_ASKS)}"]


# ---- multi-turn ----------------------------------------------------------------------------------

FOLLOW_CODE = ("Can you show an example call and its result?", "How would you test it?",
               "What happens if the input is empty or None?", "Could you simplify it?",
               "Rewrite it with more descriptive variable names.")
FOLLOW_MATH = ("Now solve the same problem with all the numbers doubled.", "Can you check the answer another way?",
               "Explain the solution to a child.", "Write a similar problem and solve it.")
FOLLOW_TEXT = ("Give a concrete example of this.", "What questions might a reader still have?",
               "Explain that in one sentence to a child.", "Write a short code snippet that shows it.")


def multi_turn_prompt(rng):
    kind = rng.randrange(3)
    if kind == 0:
        module, name, src, doc = stdlib_function(rng, with_doc=True)
        return ([f"What does this function from `{module}` do?\n\n{_code(src)}", rng.choice(FOLLOW_CODE)],
                [" ".join(doc.split("\n\n")[0].split())])
    if kind == 1:
        question, solution = word_problem(rng)
        return [question, rng.choice(FOLLOW_MATH)], [solution]
    text = passage(rng)
    first = " ".join(sentences(text)[:2]) or text[:200]
    return [f"What is this text about?\n\n{text}", rng.choice(FOLLOW_TEXT)], [first]


GENERATORS = {"code": code_prompt, "instruction": instruction_prompt, "summarization": summarization_prompt,
              "qa": qa_prompt, "rewrite": rewrite_prompt, "translation": translation_prompt,
              "math": math_prompt, "multi_turn": multi_turn_prompt}


def build_prompts(n: int, seed: int = 0) -> list[dict]:
    """`n` distinct prompt rows, categories mixed by `CATEGORIES`' shares, deterministic in
    `seed` (on a given Python installation: the sources are its standard library)."""
    if n < 1:
        raise ValueError(f"need at least one prompt, got n={n}")
    rng = random.Random(seed)
    names, weights = list(CATEGORIES), list(CATEGORIES.values())
    rows, seen, misses = [], set(), 0
    while len(rows) < n:
        cat = rng.choices(names, weights)[0]
        made = GENERATORS[cat](rng)
        turns, replies = made if isinstance(made, tuple) else (made, [])
        key = "\x00".join(turns + replies)
        if key in seen:
            misses += 1
            if misses > 10 * n:
                raise ValueError(f"only {len(rows)} distinct prompts could be built, {n} asked")
            continue
        seen.add(key)
        rows.append({"id": f"{cat}-{len(rows)}", "category": cat, "turns": turns, "replies": replies,
                     "prompt": None})
    return rows
