"""Objects the registry tests patch (a module function, a class with plain, static and class methods)."""


def greet(name):
    return f"hello {name}"


def shout(name):
    return f"HEY {name}"


class Speaker:
    def say(self, word):
        return word

    @staticmethod
    def static_say(word):
        return word

    @classmethod
    def class_say(cls, word):
        return f"{cls.__name__}:{word}"


class LoudSpeaker(Speaker):
    pass
