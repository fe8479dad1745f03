"""Generated math word problems with their worked solutions, numbers drawn so each answer is
exact, and the cast of names and things they (and other generated prompts) use."""

from __future__ import annotations

import math
from fractions import Fraction

NAMES = ("Amina", "Ben", "Chloe", "Diego", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kofi",
         "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Wen")
ITEMS = (("notebook", "notebooks"), ("apple", "apples"), ("ticket", "tickets"), ("sandwich", "sandwiches"),
         ("pencil", "pencils"), ("plant", "plants"), ("candle", "candles"), ("mug", "mugs"))


def _money(x) -> str:
    return f"${x:,.2f}"


def word_problem(rng) -> tuple[str, str]:
    """(question, worked solution), numbers drawn so the answer is exact."""
    name, other = rng.sample(NAMES, 2)
    item, items = rng.choice(ITEMS)
    k = rng.randrange(9)
    if k == 0:
        n, price = rng.randint(3, 12), rng.randint(2, 40) * 0.25
        paid = math.ceil(n * price / 10) * 10 + rng.choice((0, 10, 20))
        return (f"{name} buys {n} {items} at {_money(price)} each and pays with {_money(paid)}. How much change "
                f"does {name} get?",
                f"The {items} cost {n} x {_money(price)} = {_money(n * price)}. The change is {_money(paid)} - "
                f"{_money(n * price)} = {_money(paid - n * price)}.")
    if k == 1:
        speed, hours = rng.choice((40, 45, 60, 72, 80, 90)), rng.choice((1.5, 2, 2.5, 3, 4))
        start_h, start_m = rng.randint(6, 15), rng.choice((0, 15, 30, 45))
        end = start_h * 60 + start_m + int(hours * 60)
        return (f"A bus covers {speed * hours:g} km at a steady {speed} km/h, leaving at {start_h}:{start_m:02d}. "
                f"When does it arrive?",
                f"Time = distance / speed = {speed * hours:g} / {speed} = {hours:g} hours = {int(hours * 60)} minutes. "
                f"{start_h}:{start_m:02d} plus {int(hours * 60)} minutes is {end // 60}:{end % 60:02d}.")
    if k == 2:
        price, off, tax = rng.randint(20, 300), rng.choice((10, 15, 20, 25, 30)), rng.choice((5, 8, 10))
        sale = price * (100 - off) / 100
        return (f"A jacket costs {_money(price)}. It is {off}% off, and then {tax}% sales tax is added. "
                f"What is the final price?",
                f"After the discount: {_money(price)} x {(100 - off) / 100:g} = {_money(sale)}. With tax: "
                f"{_money(sale)} x {1 + tax / 100:g} = {_money(sale * (1 + tax / 100))}.")
    if k == 3:
        weekly, goal = rng.randint(5, 60), rng.randint(100, 1500)
        weeks = math.ceil(goal / weekly)
        return (f"{name} puts aside {_money(weekly)} every week to buy something that costs {_money(goal)}. "
                f"After how many weeks can {name} afford it?",
                f"{_money(goal)} / {_money(weekly)} = {goal / weekly:.2f}, so {name} needs {weeks} whole weeks "
                f"(after {weeks} weeks the savings are {_money(weeks * weekly)}).")
    if k == 4:
        w, l, cost = rng.randint(3, 30), rng.randint(4, 50), rng.randint(2, 15)
        return (f"A garden is {l} m long and {w} m wide. Fencing costs {_money(cost)} per metre. What is the area "
                f"of the garden, and how much does it cost to fence it all round?",
                f"Area = {l} x {w} = {l * w} square metres. Perimeter = 2 x ({l} + {w}) = {2 * (l + w)} m, so the "
                f"fence costs {2 * (l + w)} x {_money(cost)} = {_money(2 * (l + w) * cost)}.")
    if k == 5:
        young, times, years = rng.randint(3, 15), rng.randint(2, 4), rng.randint(2, 10)
        old = young * times
        total = old + young + 2 * years
        return (f"{name} is {times} times as old as {other}. In {years} years their ages will add up to {total}. "
                f"How old are they now?",
                f"Let {other} be x, so {name} is {times}x. In {years} years: ({times}x + {years}) + (x + {years}) = "
                f"{total}, so {times + 1}x = {total - 2 * years} and x = {young}. {other} is {young} and {name} "
                f"is {old}.")
    if k == 6:
        a, b = rng.sample((2, 3, 4, 5, 6, 8, 10, 12), 2)
        together = Fraction(a * b, a + b)
        return (f"One tap fills a tank in {a} hours and another fills it in {b} hours. How long do they take "
                f"together?",
                f"Rates: 1/{a} + 1/{b} = {Fraction(1, a) + Fraction(1, b)} of the tank per hour, so together they "
                f"take {together} hours (about {float(together):.2f} hours).")
    if k == 7:
        people, grams, want = rng.choice((2, 4, 6)), rng.randint(100, 600), rng.choice((3, 5, 8, 10, 12))
        return (f"A recipe for {people} people uses {grams} g of flour. How much flour is needed for {want} "
                f"people?",
                f"Per person: {grams} / {people} = {grams / people:g} g. For {want} people: {want} x "
                f"{grams / people:g} = {grams * want / people:g} g.")
    scores = [rng.randint(55, 98) for _ in range(rng.randint(3, 5))]
    target = min(95, round(sum(scores) / len(scores)) + rng.randint(2, 6))
    need = target * (len(scores) + 1) - sum(scores)
    return (f"{name}'s test scores are {', '.join(map(str, scores))}. What is the average, and what score is "
            f"needed on the next test to bring the average to {target}?",
            f"The average is {sum(scores)} / {len(scores)} = {sum(scores) / len(scores):.2f}. An average of {target} "
            f"over {len(scores) + 1} tests needs a total of {target * (len(scores) + 1)}, so the next score must be "
            f"{target * (len(scores) + 1)} - {sum(scores)} = {need}" + (" (more than 100: not possible)." if need > 100 else "."))

