"""Every fix gpudoctor can apply, one object each (`base.Fix`): what it is, when it is proposed and when it
does not apply, its patch (apply, undo, switch at runtime), the evidence that it took effect, and its
change in the user's source or framework call. `catalog.FIXES` lists them."""
