"""Scoring: score_response() and the SCORERS registry (exact, normalized, includes, f1, math, regex, choice,
numeric).

Items are built through _validate_row() so every test also goes through dataset validation.
"""
import json
import os
import unittest

from tests.support import eh

FOUR = ["red", "green", "blue", "yellow"]


def item(**fields) -> "eh.QAItem":
    """A validated QAItem from a row with defaults id='x', prompt='p'; ``fields`` override or add."""
    row = {"id": "x", "prompt": "p"}
    row.update(fields)
    return eh._validate_row(row, "t.jsonl:1", "normalized")


def score(it, response):
    return eh.score_response(it, response)


class TestScorerRegistry(unittest.TestCase):
    def test_registry_holds_the_scorers_when_imported(self):
        self.assertEqual(sorted(eh.SCORERS), ["choice", "exact", "f1", "includes", "judge", "math", "normalized",
                                              "numeric", "regex"])

    def test_score_response_dispatches_on_item_scorer_when_scorers_differ(self):
        # the same text scores differently under exact and normalized: dispatch follows item.scorer
        self.assertEqual(score(item(answer="Paris", scorer="exact"), "paris."), (0.0, "paris."))
        self.assertEqual(score(item(answer="Paris", scorer="normalized"), "paris."), (1.0, "paris"))

    def test_default_scorer_is_used_when_row_names_none(self):
        self.assertEqual(item(answer="Paris").scorer, "normalized")  # the default given to _validate_row
        self.assertEqual(eh.Dataset(None, rows=[{"prompt": "p", "answer": "Paris"}]).validate().default_scorer,
                         "includes")
        it = eh._validate_row({"id": "x", "prompt": "p", "answer": "7"}, "t.jsonl:1", "numeric")
        self.assertEqual(it.scorer, "numeric")

    def test_choice_is_the_scorer_when_row_has_choices_and_no_scorer(self):
        self.assertEqual(item(answer="B", choices=FOUR).scorer, "choice")


class TestExactScorer(unittest.TestCase):
    def test_match_when_only_surrounding_whitespace_differs(self):
        self.assertEqual(score(item(answer="DE", scorer="exact"), "  DE\n"), (1.0, "DE"))

    def test_no_match_when_case_differs(self):
        self.assertEqual(score(item(answer="DE", scorer="exact"), "de"), (0.0, "de"))

    def test_no_match_when_punctuation_added(self):
        self.assertEqual(score(item(answer="H2O", scorer="exact"), "H2O.")[0], 0.0)


class TestNormalizedScorer(unittest.TestCase):
    def test_match_when_case_differs(self):
        self.assertEqual(score(item(answer="Paris"), "PARIS"), (1.0, "paris"))

    def test_match_when_whitespace_differs(self):
        self.assertEqual(score(item(answer="carbon dioxide"), "  carbon \t\n dioxide  "), (1.0, "carbon dioxide"))

    def test_match_when_punctuation_differs(self):
        self.assertEqual(score(item(answer="thank you"), "Thank-you!!"), (1.0, "thank you"))

    def test_match_when_articles_a_an_the_added_or_dropped(self):
        it = item(answer="The Eiffel Tower")
        self.assertEqual(score(it, "eiffel tower"), (1.0, "eiffel tower"))
        self.assertEqual(score(it, "an Eiffel Tower"), (1.0, "eiffel tower"))
        self.assertEqual(score(it, "A eiffel tower."), (1.0, "eiffel tower"))

    def test_article_letters_inside_words_are_kept_when_normalizing(self):
        # "an"/"the"/"a" are removed only as whole words: "anthem" and "theatre" survive
        self.assertEqual(score(item(answer="anthem"), "The anthem"), (1.0, "anthem"))
        self.assertEqual(score(item(answer="theatre"), "atheatre")[0], 0.0)

    def test_no_match_when_words_differ(self):
        it = item(answer="Indian Ocean")
        self.assertEqual(score(it, "Indian Oceans"), (0.0, "indian oceans"))
        self.assertEqual(score(it, "Indian")[0], 0.0)

    def test_no_match_when_response_is_empty(self):
        self.assertEqual(score(item(answer="Paris"), ""), (0.0, ""))


class TestIncludesScorer(unittest.TestCase):
    def test_a_free_text_reference_scores_inside_a_sentence(self):
        self.assertEqual(score(item(answer="Paris", scorer="includes"), "The capital of France is Paris."),
                         (1.0, "paris"))
        self.assertEqual(score(item(answer="carbon dioxide", scorer="includes"), "Plants take in CO2, i.e. Carbon "
                                                                                   "Dioxide!")[0], 1.0)
        self.assertEqual(score(item(answer="Paris", scorer="includes"), "It is Lyon.")[0], 0.0)
        self.assertEqual(score(item(answer="Paris", scorer="includes"), "Parisian food")[0], 0.0)  # a word boundary

    def test_numbers_never_match_inside_other_numbers(self):
        for response, want in (("The answer is 711.", 0.0), ("It is 11.5", 0.0), ("about 110", 0.0),
                               ("-11 degrees", 0.0), ("The answer is 11.", 1.0), ("11.0 exactly", 1.0),
                               ("that makes 1,024", 0.0)):
            self.assertEqual(score(item(answer="11", scorer="includes"), response)[0], want, response)
        self.assertEqual(score(item(answer="1024", scorer="includes"), "that makes 1,024")[0], 1.0)

    def test_the_default_scorer_is_includes_and_rows_score_as_people_expect(self):
        ds = eh.Dataset(None, rows=[{"id": "a", "prompt": "Capital of France?", "answer": "Paris"},
                                    {"id": "b", "prompt": "7+4?", "answer": "11"}]).validate()
        a, b = ds.iter_items()
        self.assertEqual(eh.score_response(a, "The capital of France is Paris.")[0], 1.0)
        self.assertEqual(eh.score_response(b, "7 + 4 = 11")[0], 1.0)
        self.assertEqual(eh.score_response(b, "I would say 711")[0], 0.0)


class TestF1Scorer(unittest.TestCase):
    def test_token_f1_as_squad_computes_it(self):
        it = item(answer="the Eiffel Tower in Paris", scorer="f1")
        self.assertEqual(score(it, "Eiffel Tower")[0], 0.666667)   # p=1, r=2/4
        self.assertEqual(score(it, "eiffel tower in paris")[0], 1.0)
        self.assertEqual(score(it, "a tower in London")[0], 0.571429)  # common 2 (tower, in): p=2/3, r=2/4: 4/7
        self.assertEqual(score(it, "nothing")[0], 0.0)


class TestMathScorer(unittest.TestCase):
    def test_the_table_of_reference_and_response_pairs(self):
        """tests/data/math_pairs.json: at least 120 pairs, half of them answers that must not match."""
        with open(os.path.join(os.path.dirname(__file__), "data", "math_pairs.json"), encoding="utf-8") as fh:
            pairs = json.load(fh)
        self.assertGreaterEqual(len(pairs), 120)
        self.assertGreaterEqual(sum(not p["match"] for p in pairs), len(pairs) // 2)
        wrong = [p for p in pairs if (score(item(answer=p["reference"], scorer="math"), p["response"])[0] == 1.0)
                 != p["match"]]
        self.assertEqual(wrong, [])

    def test_extraction_takes_the_last_boxed_with_nested_braces(self):
        self.assertEqual(eh._math_extract("first \\boxed{1} then \\boxed{\\frac{a}{\\sqrt{b}}} end"),
                         "\\frac{a}{\\sqrt{b}}")
        self.assertEqual(eh._math_extract("no box; the final answer is 7."), "7")
        self.assertEqual(eh._math_extract("numbers 3 and then 8"), "8")
        self.assertEqual(eh._math_extract("nothing here"), "")

    def test_no_computer_algebra_equal_forms_of_an_expression_do_not_match(self):
        """Documented limit (README): 2x+2 and 2(x+1) are equal, but only a CAS could tell; math-verify says match."""
        self.assertEqual(score(item(answer="2x+2", scorer="math"), "\\boxed{2(x+1)}")[0], 0.0)
        self.assertEqual(score(item(answer="2x+2", scorer="math"), "\\boxed{2x + 2}")[0], 1.0)

    def test_a_solution_reference_is_its_boxed_answer(self):
        it = item(answer="We add: 2 + 3 = \\boxed{5}.", scorer="math")
        self.assertEqual(score(it, "\\boxed{5}"), (1.0, "5"))
        self.assertEqual(score(it, "\\boxed{2}")[0], 0.0)


class TestRegexScorer(unittest.TestCase):
    def test_row_pattern_extracts_the_answer_when_present(self):
        it = item(answer="Andes", scorer="regex", pattern=r"ANSWER:\s*(\w+)")
        self.assertEqual(score(it, "Long chain of mountains.\nANSWER: Andes"), (1.0, "Andes"))

    def test_last_match_counts_when_pattern_matches_twice(self):
        it = item(answer="Andes", scorer="regex", pattern=r"ANSWER:\s*(\w+)")
        self.assertEqual(score(it, "ANSWER: Alps\nwait, no.\nANSWER: Andes"), (1.0, "Andes"))
        self.assertEqual(score(it, "ANSWER: Andes\nwait, no.\nANSWER: Alps"), (0.0, "Alps"))

    def test_extracted_text_is_compared_normalized_when_matched(self):
        it = item(answer="Shakespeare", scorer="regex", pattern=r"ANSWER:\s*([A-Za-z ]+)")
        self.assertEqual(score(it, "ANSWER: shakespeare"), (1.0, "shakespeare"))

    def test_row_pattern_is_used_not_default_when_both_could_match(self):
        # the default pattern would extract "Lyon"; the row's pattern only looks at FINAL=
        it = item(answer="Paris", scorer="regex", pattern=r"FINAL=(\w+)")
        self.assertEqual(score(it, "The answer is Lyon. FINAL=Paris"), (1.0, "Paris"))

    def test_zero_and_empty_extraction_when_pattern_does_not_match(self):
        it = item(answer="Andes", scorer="regex", pattern=r"ANSWER:\s*(\w+)")
        self.assertEqual(score(it, "Andes"), (0.0, ""))

    def test_default_pattern_extracts_after_answer_when_row_has_no_pattern(self):
        it = item(answer="Paris", scorer="regex")
        self.assertIsNone(it.pattern)
        self.assertEqual(score(it, "Let me think.\nThe answer is Paris"), (1.0, "Paris"))
        self.assertEqual(score(it, "Answer: paris."), (1.0, "paris."))

    def test_default_pattern_takes_last_match_when_answer_restated(self):
        it = item(answer="Paris", scorer="regex")
        self.assertEqual(score(it, "answer: Lyon\nFinal answer: Paris"), (1.0, "Paris"))

    def test_default_pattern_scores_zero_when_no_answer_marker(self):
        self.assertEqual(score(item(answer="Paris", scorer="regex"), "Paris"), (0.0, ""))


class TestChoiceScorer(unittest.TestCase):
    def setUp(self):
        self.b = item(answer="B", choices=FOUR)
        self.c = item(answer="C", choices=FOUR)
        self.d = item(answer="D", choices=FOUR)

    def test_letter_found_when_stated_in_parentheses(self):
        self.assertEqual(score(self.b, "The answer is (B)."), (1.0, "B"))

    def test_letter_found_when_in_bold(self):
        self.assertEqual(score(self.c, "**C**"), (1.0, "C"))

    def test_letter_found_when_after_answer_colon(self):
        self.assertEqual(score(self.d, "Answer: D"), (1.0, "D"))

    def test_letter_found_when_it_starts_a_line_with_a_parenthesis(self):
        self.assertEqual(score(self.b, "B) because green is the colour of grass"), (1.0, "B"))

    def test_letter_found_when_alone_on_a_line(self):
        self.assertEqual(score(self.b, "Let me think about the colours.\nB\n"), (1.0, "B"))

    def test_explicit_statement_wins_when_other_letters_mentioned(self):
        self.assertEqual(score(self.c, "The answer is C, not A."), (1.0, "C"))
        self.assertEqual(score(self.c, "The answer is C.\nD is wrong."), (1.0, "C"))

    def test_wrong_letter_scores_zero_when_found(self):
        self.assertEqual(score(self.b, "The answer is (D)."), (0.0, "D"))

    def test_option_text_accepted_when_exactly_one_option_matches(self):
        self.assertEqual(score(self.b, "I think it is green."), (1.0, "B"))
        self.assertEqual(score(self.c, "The answer is blue."), (1.0, "C"))

    def test_option_text_rejected_when_several_options_match(self):
        self.assertEqual(score(self.b, "either green or blue"), (0.0, ""))

    def test_dataset_answer_given_as_option_text_is_stored_as_letter_when_validated(self):
        it = item(answer="blue", choices=FOUR)
        self.assertEqual(it.answer, "C")
        self.assertEqual(score(it, "C"), (1.0, "C"))

    def test_article_a_is_not_choice_a_when_another_letter_is_present(self):
        self.assertEqual(score(self.c, "A good guess is C."), (1.0, "C"))
        self.assertEqual(score(self.b, "A reasonable choice would be B"), (1.0, "B"))

    def test_a_is_choice_a_when_it_is_the_only_candidate(self):
        it = item(answer="A", choices=FOUR)
        self.assertEqual(score(it, "A"), (1.0, "A"))
        self.assertEqual(score(it, "I'd pick A."), (1.0, "A"))

    def test_lowercase_article_a_after_answer_is_not_choice_a_when_c_follows(self):
        # Regression (fixed): the first _CHOICE_PATTERNS entry is compiled with (?i), so its [A-Z] also matches the lowercase
        # article in "The answer is a bit tricky" and returns "A" before the real letter C is ever looked at.
        self.assertEqual(score(self.c, "The answer is a bit tricky, but C"), (1.0, "C"))
        self.assertEqual(score(self.c, "My answer: a careful look shows C."), (1.0, "C"))

    def test_letters_outside_the_choices_are_ignored_when_present(self):
        # four choices: E is not an option, so it is neither taken nor allowed to mask the real letter
        self.assertEqual(score(self.b, "The answer is E."), (0.0, ""))
        self.assertEqual(score(self.b, "E"), (0.0, ""))
        self.assertEqual(score(self.b, "Answer: E. On reflection, (B)."), (1.0, "B"))

    def test_choice_range_follows_number_of_choices_when_only_two(self):
        it = item(answer="B", choices=["yes", "no"])
        self.assertEqual(score(it, "The answer is (C)."), (0.0, ""))
        self.assertEqual(score(it, "**B**"), (1.0, "B"))

    def test_nothing_extracted_when_response_has_no_letter_or_option(self):
        self.assertEqual(score(self.b, "I do not know."), (0.0, ""))


class TestNumericScorer(unittest.TestCase):
    def test_match_when_answer_has_thousands_separator(self):
        it = item(answer="3,600", scorer="numeric")
        self.assertEqual(score(it, "3600"), (1.0, "3600.0"))
        self.assertEqual(score(it, "There are 3,600 seconds."), (1.0, "3600.0"))

    def test_match_when_answer_has_unit(self):
        it = item(answer="2.4 m", scorer="numeric")
        self.assertEqual(score(it, "Each part is 2.4 m long."), (1.0, "2.4"))
        self.assertEqual(score(it, "2.40m"), (1.0, "2.4"))

    def test_match_when_currency_and_separators_present(self):
        it = item(answer="$1,234.50", scorer="numeric")
        self.assertEqual(score(it, "It costs $1,234.50."), (1.0, "1234.5"))
        self.assertEqual(score(it, "1234.5"), (1.0, "1234.5"))
        self.assertEqual(score(it, "$1,234.51")[0], 0.0)

    def test_tolerance_field_accepts_within_and_rejects_outside(self):
        it = item(answer="2.4", scorer="numeric", tolerance=0.01)
        self.assertEqual(it.tolerance, 0.01)
        self.assertEqual(score(it, "2.405")[0], 1.0)
        self.assertEqual(score(it, "2.39")[0], 1.0)
        self.assertEqual(score(it, "2.42")[0], 0.0)

    def test_default_tolerance_is_tight_when_no_tolerance_given(self):
        it = item(answer="2.4", scorer="numeric")
        self.assertEqual(score(it, "2.405")[0], 0.0)
        self.assertEqual(score(it, "2.4000000")[0], 1.0)

    def test_large_tolerance_when_given_as_integer(self):
        it = item(answer="300000", scorer="numeric", tolerance=1000)
        self.assertEqual(score(it, "about 299,792 km/s")[0], 1.0)
        self.assertEqual(score(it, "about 298,000 km/s")[0], 0.0)

    def test_negative_number_matches_only_negative_when_answer_negative(self):
        it = item(answer="-5", scorer="numeric")
        self.assertEqual(score(it, "It is -5 degrees."), (1.0, "-5.0"))
        self.assertEqual(score(it, "It is \u22125 degrees."), (1.0, "-5.0"))  # U+2212 minus sign
        self.assertEqual(score(it, "It is 5 degrees."), (0.0, "5.0"))

    def test_positive_answer_rejects_negative_response_when_sign_differs(self):
        self.assertEqual(score(item(answer="3600", scorer="numeric"), "-3600"), (0.0, "-3600.0"))

    def test_hyphen_in_a_range_is_not_a_minus_sign_when_preceded_by_a_digit(self):
        # Regression (fixed): _NUMBER_RE allows a sign right after a digit, so "4-5 days" parses its last number as -5.
        self.assertEqual(score(item(answer="5", scorer="numeric"), "It takes 4-5 days, so 4-5"), (1.0, "5.0"))

    def test_last_number_wins_when_several_present(self):
        it = item(answer="391", scorer="numeric")
        self.assertEqual(score(it, "17 * 23 = 391"), (1.0, "391.0"))
        self.assertEqual(score(it, "391? No: 17 * 23 = 392"), (0.0, "392.0"))

    def test_zero_and_empty_extraction_when_response_has_no_number(self):
        self.assertEqual(score(item(answer="7", scorer="numeric"), "seven"), (0.0, ""))
        self.assertEqual(score(item(answer="7", scorer="numeric"), ""), (0.0, ""))

    def test_integer_answer_when_row_gives_a_json_number(self):
        it = item(answer=206, scorer="numeric")
        self.assertEqual(it.answer, "206")
        self.assertEqual(score(it, "An adult has 206 bones."), (1.0, "206.0"))


class TestDemoReferencesScore(unittest.TestCase):
    def test_every_demo_reference_scores_one_when_given_as_response(self):
        items = list(eh.Dataset(None, rows=eh.demo_dataset(), name="demo").validate().iter_items())
        self.assertEqual(len(items), 42)
        scores = {it.id: score(it, "ANSWER: %s" % it.answer if it.scorer == "regex" else it.answer)[0] for it in items}
        self.assertEqual(scores, {it.id: 1.0 for it in items})


if __name__ == "__main__":
    unittest.main()
