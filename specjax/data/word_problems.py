"""Generated math word problems with their worked solutions, numbers drawn so each answer is
exact, and the cast of names and things they (and other generated prompts) use."""

from __future__ import annotations

import math
from fractions import Fraction

NAMES = ("Amina", "Ben", "Chloe", "Diego", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kofi",
         "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Wen")
ITEMS = (("notebook", "notebooks"), ("apple", "apples"), ("ticket", "tickets"), ("sandwich", "sandwiches"),
         ("pencil", "pencils"), ("plant", "plants"), ("candle", "candles"), ("mug", "mugs"))



def _change(rng):
    n, price = rng.randint(3, 12), rng.randint(2, 40) * 0.25
    paid = math.ceil(n * price / 10) * 10 + rng.choice((0, 10, 20))
    return dict(n=n, price=price, paid=paid, cost=n * price, change=paid - n * price)


def _bus(rng):
    speed, hours = rng.choice((40, 45, 60, 72, 80, 90)), rng.choice((1.5, 2, 2.5, 3, 4))
    start_h, start_m = rng.randint(6, 15), rng.choice((0, 15, 30, 45))
    end = start_h * 60 + start_m + int(hours * 60)
    return dict(speed=speed, hours=hours, km=speed * hours, start_h=start_h, start_m=start_m,
                minutes=int(hours * 60), end_h=end // 60, end_m=end % 60)


def _discount(rng):
    price, off, tax = rng.randint(20, 300), rng.choice((10, 15, 20, 25, 30)), rng.choice((5, 8, 10))
    sale = price * (100 - off) / 100
    return dict(price=price, off=off, tax=tax, keep=(100 - off) / 100, sale=sale, rate=1 + tax / 100,
                final=sale * (1 + tax / 100))


def _savings(rng):
    weekly, goal = rng.randint(5, 60), rng.randint(100, 1500)
    weeks = math.ceil(goal / weekly)
    return dict(weekly=weekly, goal=goal, ratio=goal / weekly, weeks=weeks, saved=weeks * weekly)


def _fence(rng):
    w, l, cost = rng.randint(3, 30), rng.randint(4, 50), rng.randint(2, 15)
    return dict(w=w, l=l, cost=cost, area=l * w, sides=l + w, perimeter=2 * (l + w), total=2 * (l + w) * cost)


def _ages(rng):
    young, times, years = rng.randint(3, 15), rng.randint(2, 4), rng.randint(2, 10)
    total = young * times + young + 2 * years
    return dict(young=young, old=young * times, times=times, years=years, total=total, times1=times + 1,
                rest=total - 2 * years)


def _taps(rng):
    a, b = rng.sample((2, 3, 4, 5, 6, 8, 10, 12), 2)
    together = Fraction(a * b, a + b)
    return dict(a=a, b=b, rate=Fraction(1, a) + Fraction(1, b), together=together, hours=float(together))


def _recipe(rng):
    people, grams, want = rng.choice((2, 4, 6)), rng.randint(100, 600), rng.choice((3, 5, 8, 10, 12))
    return dict(people=people, grams=grams, want=want, each=grams / people, need=grams * want / people)


def _scores(rng):
    scores = [rng.randint(55, 98) for _ in range(rng.randint(3, 5))]
    target = min(95, round(sum(scores) / len(scores)) + rng.randint(2, 6))
    need = target * (len(scores) + 1) - sum(scores)
    return dict(scores=", ".join(map(str, scores)), sum=sum(scores), count=len(scores), mean=sum(scores) / len(scores),
                target=target, tests=len(scores) + 1, total=target * (len(scores) + 1), need=need,
                end=" (more than 100: not possible)." if need > 100 else ".")


# (draw the numbers, question, worked solution); money is written ${x:,.2f}, the names are
# {name} and {other}, the item {items}
PROBLEMS = (
    (_change, "{name} buys {n} {items} at ${price:,.2f} each and pays with ${paid:,.2f}. How much change does "
              "{name} get?",
     "The {items} cost {n} x ${price:,.2f} = ${cost:,.2f}. The change is ${paid:,.2f} - ${cost:,.2f} = "
     "${change:,.2f}."),
    (_bus, "A bus covers {km:g} km at a steady {speed} km/h, leaving at {start_h}:{start_m:02d}. When does it arrive?",
     "Time = distance / speed = {km:g} / {speed} = {hours:g} hours = {minutes} minutes. {start_h}:{start_m:02d} "
     "plus {minutes} minutes is {end_h}:{end_m:02d}."),
    (_discount, "A jacket costs ${price:,.2f}. It is {off}% off, and then {tax}% sales tax is added. What is the "
                "final price?",
     "After the discount: ${price:,.2f} x {keep:g} = ${sale:,.2f}. With tax: ${sale:,.2f} x {rate:g} = "
     "${final:,.2f}."),
    (_savings, "{name} puts aside ${weekly:,.2f} every week to buy something that costs ${goal:,.2f}. After how many "
               "weeks can {name} afford it?",
     "${goal:,.2f} / ${weekly:,.2f} = {ratio:.2f}, so {name} needs {weeks} whole weeks (after {weeks} weeks the "
     "savings are ${saved:,.2f})."),
    (_fence, "A garden is {l} m long and {w} m wide. Fencing costs ${cost:,.2f} per metre. What is the area of the "
             "garden, and how much does it cost to fence it all round?",
     "Area = {l} x {w} = {area} square metres. Perimeter = 2 x ({l} + {w}) = {perimeter} m, so the fence costs "
     "{perimeter} x ${cost:,.2f} = ${total:,.2f}."),
    (_ages, "{name} is {times} times as old as {other}. In {years} years their ages will add up to {total}. How old "
            "are they now?",
     "Let {other} be x, so {name} is {times}x. In {years} years: ({times}x + {years}) + (x + {years}) = {total}, so "
     "{times1}x = {rest} and x = {young}. {other} is {young} and {name} is {old}."),
    (_taps, "One tap fills a tank in {a} hours and another fills it in {b} hours. How long do they take together?",
     "Rates: 1/{a} + 1/{b} = {rate} of the tank per hour, so together they take {together} hours (about "
     "{hours:.2f} hours)."),
    (_recipe, "A recipe for {people} people uses {grams} g of flour. How much flour is needed for {want} people?",
     "Per person: {grams} / {people} = {each:g} g. For {want} people: {want} x {each:g} = {need:g} g."),
    (_scores, "{name}'s test scores are {scores}. What is the average, and what score is needed on the next test "
              "to bring the average to {target}?",
     "The average is {sum} / {count} = {mean:.2f}. An average of {target} over {tests} tests needs a total of "
     "{total}, so the next score must be {total} - {sum} = {need}{end}"),
)


def word_problem(rng) -> tuple[str, str]:
    """(question, worked solution), numbers drawn so the answer is exact."""
    name, other = rng.sample(NAMES, 2)
    _, items = rng.choice(ITEMS)
    draw, question, solution = PROBLEMS[rng.randrange(len(PROBLEMS))]
    values = dict(draw(rng), name=name, other=other, items=items)
    return question.format(**values), solution.format(**values)
